"""Alias of `interp.plots.maps` (the figure modules are one package, `interp.plots`, since
issue 22); kept so that earlier imports keep working. New code imports `interp.plots`."""

import sys

from interp.plots import maps as _module

sys.modules[__name__] = _module
