"""ViT / MAE model: Sapiens parameter counts, masking, the loss, timm compatibility, lr rules."""
import math
from functools import partial

import pytest
import torch

from training.lr import param_groups, scaled_lr, warmup_cosine
from training.mae import MaskedAutoencoder, count_params
from training.vit import PRESETS, VisionTransformer, run_blocks, sincos_pos_embed


@pytest.mark.parametrize("name", ["sapiens-0.3b", "sapiens-0.6b", "sapiens-1b", "sapiens-2b"])
def test_sapiens_parameter_counts_match_the_paper(name):
    # the published figure counts encoder + MAE decoder at 1024 px (see training/vit.py)
    with torch.device("meta"):
        model = MaskedAutoencoder.from_preset(name, img_size=1024)
    published = PRESETS[name].published_params * 1e9
    total = count_params(model)
    assert abs(total / published - 1) < 0.01, (name, total, published)
    assert next(model.parameters()).device.type == "meta"  # no memory spent
    # the encoder alone is clearly smaller for the small models: the figure is not encoder-only
    assert count_params(model.encoder) < total


def test_sapiens_dimensions():
    p = PRESETS["sapiens-1b"]
    assert (p.width, p.depth, p.heads, p.mlp) == (1536, 40, 24, 6144)
    assert (p.decoder_width, p.decoder_depth, p.decoder_heads) == (512, 8, 16)


def test_sincos_table_is_fixed_and_distinct():
    table = sincos_pos_embed(64, 4)
    assert table.shape == (17, 64)
    assert torch.all(table[0] == 0)  # cls row
    assert torch.cdist(table[1:], table[1:]).add(torch.eye(16)).min() > 0.1  # every position distinct


def micro(img=64, **kw):
    torch.manual_seed(0)
    return MaskedAutoencoder.from_preset("micro", img_size=img, **kw).init_weights()


def test_patchify_roundtrip_and_masking():
    model = micro()
    x = torch.randn(3, 3, 64, 64)
    assert torch.equal(model.unpatchify(model.patchify(x)), x)
    tokens = torch.randn(3, 16, 8)
    kept, mask, restore = model.random_masking(tokens, 0.75, torch.Generator().manual_seed(1))
    assert kept.shape == (3, 4, 8)
    assert mask.sum(1).tolist() == [12, 12, 12]
    for b in range(3):  # kept tokens are exactly the unmasked ones
        visible = tokens[b][mask[b] == 0]
        assert sorted(map(tuple, visible.tolist())) == sorted(map(tuple, kept[b].tolist()))
    assert torch.equal(torch.sort(restore, 1).values, torch.arange(16).expand(3, -1))
    assert not torch.equal(mask[0], mask[1])  # per-sample masks


def test_encoder_embeds_only_the_kept_patches_with_the_same_maths():
    """forward_encoder projects the kept patches alone: the same tokens, loss and gradients as embedding
    every patch and gathering the kept ones (random_masking(tokens(images))), to 1e-5."""
    torch.manual_seed(0)
    model = micro(img=64)
    x = torch.randn(3, 3, 64, 64)

    def full_then_gather(images, mask_ratio, generator=None):  # the encoder as it was
        kept, mask, restore = model.random_masking(model.encoder.tokens(images), mask_ratio, generator)
        return model.encoder.forward_tokens(kept), mask, restore

    def step(encoder_fn):
        model.zero_grad(set_to_none=True)
        gen = torch.Generator().manual_seed(3)
        latent, mask, restore = encoder_fn(x, 0.75, gen)
        pred = model.forward_decoder(latent, restore)
        loss = model.forward_loss(x, pred, mask)
        loss.backward()
        return latent.detach(), mask, loss.item(), model.encoder.patch_embed.proj.weight.grad.clone()

    new, old = step(model.forward_encoder), step(full_then_gather)
    torch.testing.assert_close(new[0], old[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new[1], old[1], rtol=1e-6, atol=1e-6)
    assert new[2] == pytest.approx(old[2], rel=1e-5)
    torch.testing.assert_close(new[3], old[3], rtol=1e-4, atol=1e-6)


def plain_decoder(model, latent, ids_restore):
    """The MAE decoder as facebookresearch/mae runs it: every block on every token, autograd everywhere."""
    x = model.decoder_embed(latent)
    b, n = ids_restore.shape
    patches = torch.cat([x[:, 1:, :], model.mask_token.expand(b, n + 1 - x.shape[1], -1)], dim=1)
    patches = torch.gather(patches, 1, ids_restore.unsqueeze(-1).expand(-1, -1, x.shape[2]))
    x = torch.cat([x[:, :1, :], patches], dim=1) + model.decoder_pos_embed
    x = run_blocks(model.decoder_blocks, x, model.encoder.grad_checkpointing)
    return model.decoder_pred(model.decoder_norm(x)[:, 1:, :])


@pytest.mark.parametrize("name,img,checkpointing,batch", [("micro", 64, False, 3), ("tiny", 96, False, 3),
                                                          ("tiny", 96, True, 3), ("tiny", 96, False, 1)])
def test_decoder_short_cuts_keep_the_maths(name, img, checkpointing, batch):
    """The decoder's shared mask-token rows (first block) and masked-only gradient rows (last block, head)
    give the plain decoder's predictions, loss and every gradient, to float rounding (1e-5)."""
    torch.manual_seed(0)
    model = MaskedAutoencoder.from_preset(name, img_size=img, grad_checkpointing=checkpointing).init_weights()
    x = torch.randn(batch, 3, img, img)

    def step(decoder):
        model.zero_grad(set_to_none=True)
        latent, mask, restore = model.forward_encoder(x, 0.75, torch.Generator().manual_seed(3))
        pred = decoder(latent, restore)
        loss = model.forward_loss(x, pred, mask)
        loss.backward()
        return loss.item(), pred.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    new = step(partial(model.forward_decoder, grad_masked_only=True))
    old = step(partial(plain_decoder, model))
    assert new[0] == pytest.approx(old[0], rel=1e-6)
    torch.testing.assert_close(new[1], old[1], rtol=1e-6, atol=1e-6)
    assert set(new[2]) == set(old[2])
    for key, grad in old[2].items():
        torch.testing.assert_close(new[2][key], grad, rtol=1e-5, atol=1e-6 * grad.abs().max().item(), msg=key)
    with torch.no_grad():  # inference: the same predictions
        latent, _, restore = model.forward_encoder(x, 0.75, torch.Generator().manual_seed(3))
        torch.testing.assert_close(model.forward_decoder(latent, restore, grad_masked_only=True), new[1],
                                   rtol=1e-6, atol=1e-6)


def test_loss_counts_masked_patches_only():
    model = micro()
    x = torch.randn(2, 3, 64, 64)
    loss, pred, mask = model(x, generator=torch.Generator().manual_seed(0))
    assert loss.ndim == 0 and math.isfinite(loss.item())
    changed = pred.detach().clone()
    changed[mask == 0] += 100.0  # visible patches: no effect
    assert torch.allclose(model.forward_loss(x, changed, mask), loss)
    changed[mask == 1] += 1.0  # masked patches: effect
    assert model.forward_loss(x, changed, mask) > loss
    # per-patch normalised targets: zero mean, unit variance per patch
    t = model.target(x)
    assert torch.allclose(t.mean(-1), torch.zeros(2, 16), atol=1e-5)
    assert torch.allclose(t.var(-1), torch.ones(2, 16), atol=1e-3)


def test_grad_checkpointing_gives_the_same_gradients():
    x = torch.randn(2, 3, 64, 64)
    grads = []
    for ckpt in (False, True):
        model = micro(grad_checkpointing=ckpt)
        loss, _, _ = model(x, generator=torch.Generator().manual_seed(0))
        loss.backward()
        grads.append(model.encoder.blocks[0].mlp.fc1.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_encoder_loads_into_timm_strict_and_computes_the_same():
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    enc = micro().encoder.eval()
    timm_model = TimmViT(**enc.timm_kwargs()).eval()
    timm_model.load_state_dict(enc.state_dict(), strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(timm_model.forward_features(x), enc(x), atol=1e-5)


def test_sapiens_encoder_keys_match_timm_on_meta():
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    with torch.device("meta"):
        enc = VisionTransformer.from_preset("sapiens-0.3b", img_size=1024)
        timm_model = TimmViT(**enc.timm_kwargs())
    ours = {k: tuple(v.shape) for k, v in enc.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in timm_model.state_dict().items()}
    assert ours == theirs


def test_lr_rules():
    assert scaled_lr(1.5e-4, 4096) == pytest.approx(2.4e-3)
    lrs = [warmup_cosine(s, 100, 10) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))  # cosine decays monotonically
    assert lrs[-1] < 0.001
    assert warmup_cosine(10 + 45, 100, 10) == pytest.approx(0.5)  # halfway down the cosine


def test_no_weight_decay_on_norms_biases_positions_tokens():
    model = micro()
    decay, no_decay = param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    decay_names = {names[id(p)] for p in decay["params"]}
    assert "encoder.cls_token" in no_decay_names and "mask_token" in no_decay_names
    assert "encoder.blocks.0.norm1.weight" in no_decay_names and "encoder.blocks.0.attn.qkv.bias" in no_decay_names
    assert "encoder.blocks.0.attn.qkv.weight" in decay_names and "decoder_pred.weight" in decay_names
    assert "encoder.pos_embed" not in decay_names | no_decay_names  # fixed: not optimised at all
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0


def test_flops_formula_matches_torch_flop_counter_and_the_model_card():
    from torch.utils.flop_counter import FlopCounterMode

    from training.flops import encoder_linear_macs, mae_forward_flops

    model = micro(img=64)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    executed = mae_forward_flops("micro", 64, batch_size=2)  # the mask token projected once per position
    assert counter.get_total_flops() / 2 == pytest.approx(executed, rel=0.02)
    assert mae_forward_flops("micro", 64) - executed == 2 * (16 - 4 - 16 / 2) * 3 * 64 * 64
    # at batch 1 sharing would project more rows than it saves: the decoder does not share, nor counts it
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x[:1])
    assert counter.get_total_flops() == pytest.approx(mae_forward_flops("micro", 64, batch_size=1), rel=0.02)
    assert mae_forward_flops("micro", 64, batch_size=1) == mae_forward_flops("micro", 64)
    # Sapiens model cards: TFLOPs = linear multiply-adds of the encoder at 1024 px
    for name, card in (("sapiens-0.3b", 1.242), ("sapiens-0.6b", 2.583), ("sapiens-1b", 4.647), ("sapiens-2b", 8.709)):
        assert encoder_linear_macs(name, 1024) / 1e12 == pytest.approx(card, rel=0.01), name


def test_training_step_keeps_the_reference_maths():
    """The faster step (fused AdamW as the training loop builds it) gives the losses of the plain step
    (torch's default AdamW, as on main and in facebookresearch/mae) on the same seed and batch, to 1e-5."""
    from training.lr import adamw

    def run(make_opt):
        torch.manual_seed(0)
        model = MaskedAutoencoder.from_preset("micro", img_size=64).init_weights()
        opt = make_opt(param_groups(model, 0.05))
        x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
        gen = torch.Generator().manual_seed(2)
        out = []
        for _ in range(4):
            loss, _, _ = model(x, generator=gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            out.append(loss.item())
        return out, model

    fast, m1 = run(lambda g: adamw(g, 1e-2, (0.9, 0.95)))
    plain, m2 = run(lambda g: torch.optim.AdamW(g, lr=1e-2, betas=(0.9, 0.95)))
    assert fast == pytest.approx(plain, rel=1e-5, abs=1e-6)
    assert fast[-1] < fast[0]  # the steps really moved the weights
    # Adam divides by sqrt(v): a weight whose gradients are ~0 can move by a rounding-sized step either way
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=2e-3)


@pytest.mark.train
def test_compiled_blocks_keep_the_loss_and_gradients():
    """compile_blocks (pretraining's `compile: true`): torch.compile of every block, the decoder's first and
    last blocks with their extra arguments included, gives the eager loss and gradients."""
    import torch._dynamo

    from training.mae import compile_blocks

    torch.manual_seed(0)
    model = micro(img=32)
    x = torch.randn(2, 3, 32, 32)

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(x, generator=torch.Generator().manual_seed(1))[0]
        loss.backward()
        return loss.item(), model.decoder_blocks[0].attn.qkv.weight.grad.clone()

    eager = step()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compile_blocks(model)
    compiled = step()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert graphs >= 2  # really compiled: the plain blocks and the decoder's block with extra arguments
    assert torch._dynamo.config.recompile_limit >= 32
    assert compiled[0] == pytest.approx(eager[0], rel=1e-5)
    torch.testing.assert_close(compiled[1], eager[1], rtol=1e-4, atol=1e-6)
