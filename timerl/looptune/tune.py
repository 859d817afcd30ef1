"""``python -m timerl.looptune.tune --policy P "mk,kn->mn" --shape 128,256,64``: the CLI of
:func:`timerl.looptune.tune` (see :mod:`timerl.looptune.tuning`). The package imports
the function, not this module, so ``timerl.looptune.tune`` stays the function."""

import sys

from timerl.looptune.tuning import main

if __name__ == "__main__":
    sys.exit(main())
