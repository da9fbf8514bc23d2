"""weights_checksum: equal for equal weights wherever they are, different for any change that matters."""

import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.weights import weights_checksum


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(4, 3, generator=g), "b.bias": torch.randn(5, generator=g)}


def test_same_weights_same_checksum_in_any_order_and_layout():
    w = _weights()
    c = weights_checksum(w)
    assert len(c) == 64 and c == weights_checksum(dict(reversed(list(w.items()))))
    assert c == weights_checksum(list(w.items()))
    transposed_back = {"a.weight": w["a.weight"].t().contiguous().t(), "b.bias": w["b.bias"].clone()}
    assert not transposed_back["a.weight"].is_contiguous()
    assert weights_checksum(transposed_back) == c


def test_a_model_and_its_copy_agree():
    m = torch.nn.Linear(3, 2)
    n = torch.nn.Linear(3, 2)
    n.load_state_dict(m.state_dict())
    assert weights_checksum(m.state_dict()) == weights_checksum(n.state_dict())


@pytest.mark.parametrize(
    "change",
    [
        lambda w: w["a.weight"].__setitem__((0, 0), w["a.weight"][0, 0] + 1e-5),  # one value, slightly
        lambda w: w.__setitem__("b.bias", w["b.bias"].to(torch.float64)),  # dtype
        lambda w: w.__setitem__("a.weight", w["a.weight"].reshape(3, 4)),  # shape
        lambda w: w.__setitem__("c.weight", w.pop("a.weight")),  # name
    ],
)
def test_every_relevant_change_changes_it(change):
    w = _weights()
    before = weights_checksum(w)
    change(w)
    assert weights_checksum(w) != before


def test_bfloat16_is_hashed_by_its_bytes():
    w = {k: v.to(torch.bfloat16) for k, v in _weights().items()}
    assert weights_checksum(w) != weights_checksum(_weights())
    assert weights_checksum(w) == weights_checksum({k: v.clone() for k, v in w.items()})


def test_bad_input_is_refused():
    with pytest.raises(ConfigError, match="at least one"):
        weights_checksum({})
    with pytest.raises(ConfigError, match="same parameter name"):
        weights_checksum([("a", torch.zeros(1)), ("a", torch.zeros(1))])
    with pytest.raises(ConfigError, match="not a tensor"):
        weights_checksum({"a": [1.0]})
