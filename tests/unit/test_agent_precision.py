"""`auto` precision: bfloat16 only where the CPU computes it natively, as its CPUID flags say."""
from pathlib import Path

import pytest

from coevolve.services.agent.precision import autocast_bf16, native_bf16, resolve_dtype
from coevolve.services.learner.config import GRPOConfig
from coevolve.services.runtime.config import ConfigError

CPUINFO = Path("/proc/cpuinfo")


@pytest.mark.skipif(not CPUINFO.is_file(), reason="the CPU's flags are read from /proc/cpuinfo")
def test_native_bfloat16_on_the_cpu_is_what_its_flags_say():
    flags = {f for line in CPUINFO.read_text().splitlines() if line.startswith("flags") for f in line.split()}
    assert native_bf16("cpu") == bool(flags & {"amx_tile", "avx512_bf16"})


def test_auto_resolves_by_the_hardware_and_explicit_choices_stand():
    native = native_bf16("cpu")
    assert resolve_dtype("auto", "cpu") == ("bfloat16" if native else "float32")
    assert [resolve_dtype(d, "cpu") for d in ("float32", "bfloat16", "float16")] == ["float32", "bfloat16", "float16"]
    assert resolve_dtype("auto", "mps") == "float32"
    assert [autocast_bf16(a, "cpu") for a in ("auto", "off", "bf16")] == [native, False, True]


def test_the_learner_takes_auto_autocast_and_refuses_others_with_the_choices():
    assert GRPOConfig(autocast="auto").autocast == "auto"
    with pytest.raises(ConfigError, match="auto, off, bf16"):
        GRPOConfig(autocast="fp8")
