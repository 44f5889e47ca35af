"""LayerSpec: one normal form for every spelling of a layer spec."""

import pytest

from securefkm.exceptions import InputError
from securefkm.specs import LayerSpec, find_layer, layer_specs


def test_every_spelling_normalises_to_one_dict():
    assert LayerSpec.of("masking") == {"name": "masking"} and LayerSpec.of("masking").name == "masking"
    assert LayerSpec.of("dp:epsilon=1:delta=1e-5") == {"name": "dp", "epsilon": 1, "delta": 1e-5}
    assert LayerSpec.of("dp:epsilon=1,bounds=[-2,2]") == {"name": "dp", "epsilon": 1, "bounds": [-2, 2]}
    assert LayerSpec.of({"name": "cap", "max_rounds": 3}) == {"name": "cap", "max_rounds": 3}
    assert layer_specs("dp:epsilon=1:delta=1e-5,masking") == [{"name": "dp", "epsilon": 1, "delta": 1e-5},
                                                              {"name": "masking"}]
    assert layer_specs(["paillier", {"name": "dp", "epsilon": 2}])[1].get("epsilon") == 2
    assert find_layer(["masking", "dp:epsilon=4"], "dp")["epsilon"] == 4
    assert find_layer(["masking"], "paillier") is None and layer_specs(None) == []


def test_malformed_specs_are_named():
    with pytest.raises(InputError, match="needs a 'name'"):
        LayerSpec.of({"epsilon": 1})
    with pytest.raises(InputError, match="a layer spec is a name, a text spec or a dict, got int"):
        LayerSpec.of(3)
