"""Run every bench/bench_*.py in turn, each in its own process, and print their reports."""
import subprocess
import sys
from pathlib import Path


def main() -> int:
    names = sorted(p.stem for p in Path(__file__).parent.glob("bench_*.py"))
    failed = []
    for name in names:
        print(f"== {name}", flush=True)
        if subprocess.call([sys.executable, "-m", f"bench.{name}", *sys.argv[1:]]) != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
