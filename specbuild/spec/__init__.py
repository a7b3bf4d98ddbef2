"""The pipeline spec (being split by concern; for now everything lives in `schema`)."""

from specbuild.spec.schema import *  # noqa: F403
from specbuild.spec.schema import __all__  # noqa: F401
