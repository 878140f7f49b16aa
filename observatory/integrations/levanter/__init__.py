"""Levanter integration: the `observatory` tracker type, registered with Levanter on import.

    import observatory.integrations.levanter  # registers `type: observatory` for trainer.tracker

or run `python -m observatory.integrations.levanter.train_lm --config_path CFG`, which imports
this package and then runs Levanter's `train_lm`. Needs the `levanter` extra
(`pip install 'observatory[levanter]'`).
"""

from observatory.integrations.levanter.names import NAMES, translate
from observatory.integrations.levanter.tracker import ObservatoryConfig, ObservatoryTracker, jsonable

__all__ = ["ObservatoryConfig", "ObservatoryTracker", "NAMES", "translate", "jsonable"]
