"""How a sub-task learns its run is over for it (stopped, stalled, or its cloud lost from the run) or paused."""


class Stopped(RuntimeError):
    """The run was stopped or abandoned (or this cloud lost from it); the sub-task exits without committing."""


class Paused(RuntimeError):
    """The run pauses after a committed round (``crosscloud.scheduler.pauses``): the sub-task exits once the round's
    global is made, and a sub-task started again later resumes from its saved state."""
