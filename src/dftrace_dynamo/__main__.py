"""``python -m dftrace_dynamo``: the same as the ``dftrace-dynamo`` command."""

import sys

from dftrace_dynamo.cli import main

sys.exit(main())
