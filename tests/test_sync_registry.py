"""``sync.registry``: a model's name to its policy, and what the model is without building one."""

import pytest

from ebsp_mpi.config import SyncConfig
from ebsp_mpi.sync.registry import POLICIES, make_policy, round_based


@pytest.mark.parametrize("model", POLICIES)
def test_round_based_is_what_the_built_policy_says(model):
    sync = SyncConfig(model=model)
    assert round_based(sync) is make_policy(sync, 3).round_based
    assert round_based(sync) == (model == "bsp")  # BSP alone applies rounds today (docs/design.md)


def test_round_based_of_an_unknown_model_names_the_models():
    with pytest.raises(ValueError, match="unknown sync model 'sssp'; expected one of bsp, asp"):
        round_based(SyncConfig(model="sssp"))
