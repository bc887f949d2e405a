"""Alias of `interp.plots.training` (the figure modules are one package, `interp.plots`, since
issue 22); kept so that earlier imports keep working. New code imports `interp.plots`."""

import sys

from interp.plots import training as _module

sys.modules[__name__] = _module
