"""The one way a sub-task learns its run is over for it: stopped, stalled, or its cloud lost from the run."""


class Stopped(RuntimeError):
    """The run was stopped or abandoned (or this cloud lost from it); the sub-task exits without committing."""
