"""Symbolic index expressions shared by every layer (see ``expr.py`` for the grammar)."""

from timerl.symbolic.expr import (
    FALSE as FALSE,
)
from timerl.symbolic.expr import (
    ONE as ONE,
)
from timerl.symbolic.expr import (
    TRUE as TRUE,
)
from timerl.symbolic.expr import (
    ZERO as ZERO,
)
from timerl.symbolic.expr import (
    Add as Add,
)
from timerl.symbolic.expr import (
    And as And,
)
from timerl.symbolic.expr import (
    Const as Const,
)
from timerl.symbolic.expr import (
    Eq as Eq,
)
from timerl.symbolic.expr import (
    Expr as Expr,
)
from timerl.symbolic.expr import (
    ExprLike as ExprLike,
)
from timerl.symbolic.expr import (
    FloorDiv as FloorDiv,
)
from timerl.symbolic.expr import (
    Index as Index,
)
from timerl.symbolic.expr import (
    Le as Le,
)
from timerl.symbolic.expr import (
    Lt as Lt,
)
from timerl.symbolic.expr import (
    Max as Max,
)
from timerl.symbolic.expr import (
    Min as Min,
)
from timerl.symbolic.expr import (
    Mod as Mod,
)
from timerl.symbolic.expr import (
    Mul as Mul,
)
from timerl.symbolic.expr import (
    Not as Not,
)
from timerl.symbolic.expr import (
    Or as Or,
)
from timerl.symbolic.expr import (
    Slice as Slice,
)
from timerl.symbolic.expr import (
    Sym as Sym,
)
from timerl.symbolic.expr import (
    evaluate as evaluate,
)
from timerl.symbolic.expr import (
    free_symbols as free_symbols,
)
from timerl.symbolic.expr import (
    index_symbols as index_symbols,
)
from timerl.symbolic.expr import (
    is_bool as is_bool,
)
from timerl.symbolic.expr import (
    lift as lift,
)
from timerl.symbolic.expr import (
    logical_and as logical_and,
)
from timerl.symbolic.expr import (
    logical_not as logical_not,
)
from timerl.symbolic.expr import (
    logical_or as logical_or,
)
from timerl.symbolic.expr import (
    same as same,
)
from timerl.symbolic.expr import (
    smax as smax,
)
from timerl.symbolic.expr import (
    smin as smin,
)
from timerl.symbolic.expr import (
    substitute as substitute,
)
from timerl.symbolic.expr import (
    to_str as to_str,
)
from timerl.symbolic.invert import Inverse as Inverse
from timerl.symbolic.invert import invert as invert
from timerl.symbolic.simplify import (
    affine_difference as affine_difference,
)
from timerl.symbolic.simplify import (
    affine_in as affine_in,
)
from timerl.symbolic.simplify import (
    linear_form as linear_form,
)
