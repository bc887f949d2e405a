"""attnlens.interp.tools.layer_stages: every map stage of a layer, in catalogue order, for every
variant."""

import pytest
import torch

from attnlens.hooked_models import available_variants
from attnlens.interp.tools.layer_stages import layer_stage_maps

from helpers import EXACT, random_tokens, tiny_model


@pytest.mark.parametrize("variant", available_variants())
def test_all_map_stages_in_catalogue_order(variant):
    # float64: observing per-head results (MTA) re-associates the output sum, a float32 rounding
    # difference in layer 0 that reaches layer 1's pattern
    model = tiny_model(variant, positional_embedding_type="none" if variant == "cope"
                       else "rotary", dtype=torch.float64)
    tokens = random_tokens(model, batch=2, pos=9)
    maps = layer_stage_maps(model, tokens, layer=1)
    assert [m.stage.name for m in maps] == [s.name for s in model.stages(1) if s.is_map]
    for m in maps:
        assert m.layer == 1 and tuple(m.values.shape) == (2, model.cfg.n_heads, 9, 9)
    _, cache = model.run_with_cache(tokens)
    pattern = next(m for m in maps if m.stage.name == "pattern")
    torch.testing.assert_close(pattern.values, cache["pattern", 1], **EXACT)


def test_bad_layer():
    with pytest.raises(ValueError, match="outside"):
        layer_stage_maps(tiny_model(), random_tokens(tiny_model()), layer=5)
