"""The trainer: the GRPO loss (`grpo.py`), training sequences and their packing (`batch.py`, `packing.py`),
LoRA (`lora.py`), random-weight model shapes (`shapes.py`), and the trainers that update one
process's policy (`trainer.py`: plain torch; `fsdp_trainer.py`, `deepspeed_trainer.py`). `build.py` is
the one place a trainer is built. It knows nothing of ranks, the service or Kafka.
"""
