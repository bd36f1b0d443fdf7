import sys

from transformer_vq.cli import main

sys.exit(main())
