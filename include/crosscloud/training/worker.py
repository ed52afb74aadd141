"""The sub-task of one cloud: runs the run's training program there, on the SDK.

It fetches the program's code from the cloud's own store (preheated there like
the data, so a changed program needs no new image), sets the environment
``crosscloud.sdk.init()`` reads, and runs the program as ``__main__``. Inside
the cloud, several devices are several ranks launched by torchrun.

Exit codes: 0 the program trained every round; 3 the run was stopped (or the
cloud lost from it); 6 the run paused after a committed round (started again,
it resumes); 5 the round exchange failed (a store past its retries):
started again, it resumes;
4 the program failed (not found, did not import, raised, or broke the SDK's
contract), reported with the program, the cloud and the traceback: running it
again would fail again, so the watcher stops the run. Anything else (a
crash, a kill) is a sub-task that died: the watcher starts it again.

Run as ``python -m crosscloud.training.worker --tenant T --run-id R --cloud C``.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback

import torch.distributed as dist

from crosscloud.backends.base import EXCHANGE_FAILED, PAUSED, PROGRAM_FAILED, STOPPED
from crosscloud.core.federation import load_federation
from crosscloud.run.plan import Plan
from crosscloud.store.base import StoreError
from crosscloud.store.open_store import open_store
from crosscloud.training import session
from crosscloud.training.diloco import check_finished
from crosscloud.training.program import ProgramError, local_file
from crosscloud.training.stopped import Paused, Stopped


def _program_file(args: argparse.Namespace) -> tuple[str, str]:
    """The program's name and its code as a local file, from this cloud's store."""
    fed = load_federation(args.federation)
    store = open_store(fed.cloud(args.cloud), args.tenant)
    plan = Plan.load(store, args.tenant, args.run_id)
    if plan.program is None:
        raise ProgramError(f"run {args.run_id} names no training program")
    return plan.program.name, str(local_file(store, args.tenant, plan.program.code, plan.program.file))


def run_program(path: str, name: str, cloud: str) -> int:
    """Run the program as ``__main__``; its failure is reported, never retried."""
    try:
        sys.argv = [path]
        runpy.run_path(path, run_name="__main__")
        check_finished(session.current(), name)
    except Stopped as exc:
        print(f"stopping: {exc}", file=sys.stderr, flush=True)
        return STOPPED
    except Paused as exc:
        print(f"pausing: {exc}", file=sys.stderr, flush=True)
        return PAUSED
    except SystemExit as exc:
        if exc.code not in (None, 0):
            print(f"crosscloud: program {name} exited with {exc.code} on cloud {cloud}", file=sys.stderr, flush=True)
            return PROGRAM_FAILED
        check_finished(session.current(), name)
    except ProgramError as exc:
        print(f"crosscloud: {exc}", file=sys.stderr, flush=True)
        return PROGRAM_FAILED
    except StoreError as exc:  # the exchange's store past its retries, or bytes refused: a restart goes on from the state
        print(f"crosscloud: cloud {cloud}: the round exchange failed: {exc}", file=sys.stderr, flush=True)
        return EXCHANGE_FAILED
    except Exception:
        rank = os.environ.get("RANK", "0")
        print(f"crosscloud: program {name} failed on cloud {cloud} (rank {rank}):\n{traceback.format_exc()}",
              file=sys.stderr, flush=True)
        return PROGRAM_FAILED
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--cloud", required=True)
    parser.add_argument("--federation", default=None)
    args = parser.parse_args(argv)
    os.environ.update({"CROSSCLOUD_TENANT": args.tenant, "CROSSCLOUD_RUN_ID": args.run_id,
                       "CROSSCLOUD_CLOUD": args.cloud, "CROSSCLOUD_FEDERATION": args.federation or ""})
    try:
        name, path = _program_file(args)
    except ProgramError as exc:
        print(f"crosscloud: cloud {args.cloud}: {exc}", file=sys.stderr, flush=True)
        return PROGRAM_FAILED
    return run_program(path, name, args.cloud)


if __name__ == "__main__":
    sys.exit(main())
