"""Hardware-aware tuning (Roller-style): see :mod:`bitblas.tune.tuner` for the flow."""
from .space import estimate
from .space import Candidate, candidates
from .tuner import TuneResult, select_topk, tune, tune_bucket

__all__ = ["tune", "tune_bucket", "TuneResult", "Candidate", "candidates", "estimate", "select_topk"]
