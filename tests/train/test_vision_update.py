"""The reference update on a vision model's rows: the gradient reaches the vision tower, and a
rollout split into two rows (each keeping its full prefix, with the images that prefix holds)
gives the same gradient as the unsplit row, under token-mean and rollout-mean."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rowgrove.algo import loss_weights
from rowgrove.media import decode_image
from rowgrove.model.load import load_model, model_dir
from rowgrove.model.vision import Vision, load_processor
from rowgrove.train.update import ppo_clip_loss, row_microbatches, update_policy
from rowgrove.types import Row


def _image(color, size):
    import io

    from PIL import Image as PILImage

    im = PILImage.new("RGB", size, color)
    im.paste((255, 255, 255), (3, 3, 20, 20))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return decode_image(buf.getvalue())


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    model, tok = load_model("tiny-vl")
    vision = Vision(load_processor(model_dir("tiny-vl"), tok))
    a, b = _image((200, 20, 20), (90, 60)), _image((20, 20, 200), (60, 90))
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    # one rollout: [user: image a] A1 [user: image b] A2, ids as the processor expands them
    p1 = vision.expand("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>count<|im_end|>\n"
                       "<|im_start|>assistant\n", [a])
    p2 = vision.expand("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>now<|im_end|>\n"
                       "<|im_start|>assistant\n", [b])
    s1, s2 = enc("two squares") + [tok.convert_tokens_to_ids("<|im_end|>")], enc("one") + [tok.convert_tokens_to_ids("<|im_end|>")]
    ids1, glue, ids2 = enc(p1), enc("\n"), enc(p2)
    full = ids1 + s1 + glue + ids2 + s2
    mask_full = [0] * len(ids1) + [1] * len(s1) + [0] * (len(glue) + len(ids2)) + [1] * len(s2)
    rng = np.random.default_rng(0)
    lp = (-rng.random(len(full))).tolist()
    images = {a.digest: a, b.digest: b}
    return model, vision, images, full, mask_full, lp, len(ids1) + len(s1), (a.digest, b.digest)


def _row(ids, mask, lp, images, adv=1.0):
    return Row(rollout_id="r", group_id="g", input_ids=np.asarray(ids), loss_mask=np.asarray(mask),
               reward=1.0, advantage=adv, logprobs=np.asarray(lp, np.float32), images=list(images))


def _grads(model, vision, images, rows, mode):
    model.zero_grad(set_to_none=True)
    weights = loss_weights(rows, mode)

    def inputs(row):
        return vision.pixel_inputs([images[d] for d in row.images])

    for mb in row_microbatches(rows, weights, inputs):
        loss, _ = ppo_clip_loss(model, mb, 0.2)
        loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode", ["token-mean", "rollout-mean"])
def test_a_split_rollout_with_images_trains_the_same_and_reaches_the_vision_tower(setup, mode):
    model, vision, images, full, mask, lp, cut, (da, db) = setup
    unsplit = [_row(full, mask, lp, [da, db])]
    # split: row 1 is the first turn (only image a in its prefix), row 2 the whole, training only A2
    split = [_row(full[:cut], mask[:cut], lp[:cut], [da]),
             _row(full, [0] * cut + mask[cut:], lp, [da, db])]
    g1 = _grads(model, vision, images, unsplit, mode)
    g2 = _grads(model, vision, images, split, mode)
    assert g1.keys() == g2.keys()
    vision_params = [n for n in g1 if "visual" in n]
    assert vision_params, "no gradient reached the vision tower"
    assert any(float(g1[n].abs().sum()) > 0 for n in vision_params)
    for n in g1:
        torch.testing.assert_close(g1[n], g2[n], atol=1e-6, rtol=1e-4, msg=n)


def test_an_update_on_image_rows_changes_the_vision_weights(setup):
    model, vision, images, full, mask, lp, _, (da, db) = setup
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "visual" in n}
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    stats = update_policy(model, opt, [_row(full, mask, lp, [da, db])], max_grad_norm=0,
                          vision_inputs=lambda r: vision.pixel_inputs([images[d] for d in r.images]))
    assert stats["tokens_trained"] == sum(mask)
    changed = [n for n, p in model.named_parameters() if "visual" in n and not torch.equal(p, before[n])]
    assert changed
    with torch.no_grad():  # leave the shared weights as they were
        for n, p in model.named_parameters():
            if n in before:
                p.copy_(before[n])
