"""A team's training program: where its code is, how crosscloud loads it, and its files on a cloud.

A program is one Python file. Every cloud's sub-task runs it as ``__main__`` (its
training loop, on ``crosscloud.sdk``); crosscloud also imports it, not as
``__main__``, for ``build_model(args)`` (the initial global model) and
``evaluate(model, run)`` (the global model's held-out loss), and reads its
``FAMILY`` to choose the clouds' adapted images. Its code travels to the clouds
as a content-addressed blob, like data, so a change needs no image rebuild.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import traceback
from pathlib import Path
from types import ModuleType

from crosscloud.core.paths import REPO, state_dir
from crosscloud.store.base import ObjectStore
from crosscloud.store.chunks import BlobRef, read_blob

REQUIRED = ("build_model", "evaluate")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # what MLflow takes in a registered model's name, and a URI


class ProgramError(RuntimeError):
    """A training program that cannot be found, imported or run, or that broke the SDK's contract."""


def project_dir() -> Path:
    """The folder program paths are relative to: ``$CROSSCLOUD_PROJECT_DIR``, else this repository."""
    return Path(os.environ.get("CROSSCLOUD_PROJECT_DIR") or REPO).resolve()


def program_source(name: str) -> Path:
    """The file of program ``name``: a path (absolute, or relative to the project folder) or ``package.module``."""
    if name.endswith(".py") or "/" in name or os.sep in name:
        path = Path(name) if Path(name).is_absolute() else project_dir() / name
        if not path.is_file():
            raise ProgramError(f"program {name!r}: no file {path} (a relative path is taken from the project folder "
                               f"{project_dir()}; set CROSSCLOUD_PROJECT_DIR to change it)")
        return path.resolve()
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        raise ProgramError(f"program {name!r}: cannot find module: {exc}") from None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ProgramError(f"program {name!r}: no such module with a .py file in this environment "
                           f"(give a file path relative to {project_dir()}, or an importable package.module)")
    return Path(spec.origin).resolve()


def _users_part(exc: BaseException, path: Path) -> str:
    """What went wrong in the user's program, as Python says it: the frames in the program's own files (not the
    import machinery's or crosscloud's, which hide the line to fix), then the error; a syntax error with its caret."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _machinery(f.filename)]
    where = "".join(traceback.format_list(frames))
    return (f"{where}" if where else "") + "".join(traceback.format_exception_only(type(exc), exc))


def _machinery(filename: str) -> bool:
    return filename.startswith("<frozen") or str(Path(__file__).parent.parent) in filename


def load_program(path: Path, label: str | None = None) -> ModuleType:
    """Import the program at ``path`` as a module (its functions, not its training loop), checking the contract."""
    label = label or str(path)
    name = f"crosscloud_program_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ProgramError(f"program {label}: {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        raise ProgramError(f"program {label} failed to import:\n{_users_part(exc, path)}") from exc
    missing = [f for f in REQUIRED if not callable(getattr(module, f, None))]
    if missing:
        raise ProgramError(f"program {label} defines no {' or '.join(missing)}: a program defines build_model(args) "
                           "(the model crosscloud starts every cloud from) and evaluate(model, run) (its held-out loss)")
    return module


def program_family(module: ModuleType, label: str) -> str:
    """The model family the program declares, which the federation's ``images:`` list adapted images for."""
    family = getattr(module, "FAMILY", None)
    if not isinstance(family, str) or not family:
        raise ProgramError(f"program {label} defines no FAMILY: the model family whose adapted images the "
                           "federation's images: lists, e.g. FAMILY = \"byte-lm\"")
    return family


def program_model_name(module: ModuleType, path: Path, family: str, args: dict, label: str) -> str:
    """The name the program's models are registered under (without the tenant): its ``MODEL_NAME``, or what its
    ``model_name(args)`` returns (one name per architecture its arguments pick), else its file's stem and family."""
    declared = getattr(module, "MODEL_NAME", None)
    if callable(getattr(module, "model_name", None)):
        declared = module.model_name(args)
    name = f"{path.stem}-{family}" if declared is None else declared
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ProgramError(f"program {label}: model name {name!r} is not a name: letters, digits, '.', '_' and '-', "
                           "at most 100, starting with a letter or digit (set MODEL_NAME, or model_name(args))")
    return name


def cache_dir() -> Path:
    """Where a cloud's blobs become files for its program: ``$CROSSCLOUD_CACHE_DIR``, else the state folder."""
    return Path(os.environ.get("CROSSCLOUD_CACHE_DIR") or state_dir() / "cache").resolve()


def local_file(store: ObjectStore, tenant: str, ref: BlobRef, name: str) -> Path:
    """Blob ``ref`` of the cloud's store as a local file named ``name``, written once per content."""
    path = cache_dir() / ref.sha256[:2] / ref.sha256 / Path(name).name
    if path.is_file() and path.stat().st_size == ref.size:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(read_blob(store, tenant, ref))  # read_blob verifies every chunk
    tmp.replace(path)
    return path
