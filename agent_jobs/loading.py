"""Finding the deployment's `AgentApp`: `AGENT_JOBS_APP=module:attribute`, else the demo."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys

from .app import AgentApp
from .errors import AppLoadError, ConfigurationError
from .models.base import Model
from .models.registry import default_model_from_settings

log = logging.getLogger(__name__)


def load_app(path: str | None, *, strict_model: bool = False) -> AgentApp:
    """The `AgentApp` named by `module:attribute`, or the bundled demo when None.

    The demo's support agent runs on the model `AGENT_JOBS_MODEL` names, if any. A
    process that cannot use that model (no API key for the provider, say) gets the
    scripted demo and a warning; with `strict_model` it gets the `ConfigurationError`.
    """
    if not path:
        return _demo_app(strict_model)
    return _import_app(path)


def _demo_app(strict_model: bool) -> AgentApp:
    # Imported here, not above: a process that names its own app never imports the demo.
    from .demo import build_demo_app

    # The same model in the CLI and in the workers alike; a process without the
    # provider's key (the approvals listener, say) keeps the scripted demo, and says so.
    model: Model | None
    try:
        model = default_model_from_settings()
    except ConfigurationError as exc:
        if strict_model:
            raise
        log.warning("AGENT_JOBS_MODEL is not usable here (%s); the demo stays scripted", exc)
        model = None
    return build_demo_app(model)


def _import_app(path: str) -> AgentApp:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise AppLoadError(f"AGENT_JOBS_APP={path!r} must look like 'package.module:attribute'")
    # As `celery -A` does: the working directory is importable while the app loads,
    # so `myagents:app` works from the project's directory without PYTHONPATH, and
    # sys.path is left as it was found.
    try:
        cwd = os.getcwd()
    except FileNotFoundError:  # the directory was removed under us
        cwd = ""
    added = bool(cwd) and cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        # Only when the app's own module (or a package of it) is missing: an import
        # failing inside it is the module's problem, not a matter of where we looked.
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        where = ""
        if cwd and missing and (module_name == missing or module_name.startswith(f"{missing}.")):
            where = f" (looked in the current directory {cwd} and on sys.path)"
        raise AppLoadError(
            f"AGENT_JOBS_APP={path!r}: cannot import {module_name!r}: {exc}{where}"
        ) from exc
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)
    try:
        app = getattr(module, attribute)
    except AttributeError:
        raise AppLoadError(f"AGENT_JOBS_APP={path!r}: {module_name} has no {attribute!r}") from None
    if not isinstance(app, AgentApp):
        raise AppLoadError(f"AGENT_JOBS_APP={path!r} is a {type(app).__name__}, not an AgentApp")
    app.validate()
    return app
