"""``python -m mindspore_ngd.audit``: see :func:`mindspore_ngd.audit.main`."""
import sys

from . import main

sys.exit(main())
