"""Import a module on a thread while the caller waits on other processes.

``import xgboost`` takes 1.5-2 s of one core where scikit-learn is installed (xgboost's
package imports its scikit-learn API, and scikit-learn imports SciPy); the driver only
needs xgboost once its actors hold their data (the collective's tracker, the keyword
check, the returned ``Booster``). Importing it meanwhile hides that time behind Ray's
own start, the actors' start and their data loading, which run in other processes.
"""

from __future__ import annotations

import importlib
import sys
import threading
from types import ModuleType


class BackgroundImport:
    """``start()`` imports ``names`` on a daemon thread; ``result()`` waits for it and
    returns the first module (an import error is raised there, in the caller)."""

    def __init__(self, *names: str) -> None:
        self.names = names
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        if self._thread is None and not all(name in sys.modules for name in self.names):
            self._thread = threading.Thread(target=self._run, name="import", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            for name in self.names:
                importlib.import_module(name)
        except BaseException as error:  # raised again in result()
            self._error = error

    def result(self) -> ModuleType:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        for name in self.names:
            importlib.import_module(name)  # at once when done; also without start()
        return sys.modules[self.names[0]]
