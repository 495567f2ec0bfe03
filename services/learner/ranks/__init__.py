"""The ranks: a learner's training processes under torchrun. `launch.py` starts them, `group.py` says who
is who and joins the process group, `start.py` builds every rank's engine (the ranks' one way into the
trainer room), `split.py` shares each update between the ranks, `driver.py` is rank 0's side, and
`worker.py` every other rank's.
"""
