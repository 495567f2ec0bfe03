"""The ranks: a learner's training processes under torchrun. `launch.py` starts them, `group.py` says who
is who and joins the process group, `start.py` builds every rank's trainer (the ranks' one way into the
trainer room), `split.py` shares each update between the ranks, `driver.py` holds rank 0's commands and
the other ranks' following of them, and `worker.py` is every other rank's process.
"""
