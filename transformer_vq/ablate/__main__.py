"""``python -m transformer_vq.ablate REQUEST [PROBE]``: train one cell of a matrix in this process (the child the
runner starts for each training; :func:`transformer_vq.ablate.cells.main`).

An entry of the package rather than ``-m transformer_vq.ablate.cells``: the package imports ``cells``, and running
an already imported module as ``__main__`` makes Python warn in every cell's log.
"""

import sys

from transformer_vq.ablate.cells import main

sys.exit(main())
