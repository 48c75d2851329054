"""`python -m services.gateway [flags]`: the same as `tandem serve gateway`."""

import sys

from services.gateway.server import main

sys.exit(main())
