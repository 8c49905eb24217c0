"""training/torch_compat.py: the Dynamo setting it raises still exists and still limits recompiles;
fails when a torch upgrade renames it (update torch_compat with it)."""
import torch
import torch._dynamo

from training import torch_compat


def test_torch_is_a_tested_minor_version():
    minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    assert minor in torch_compat.TESTED_TORCH, (f"torch {torch.__version__} is not among the versions "
                                                f"training/torch_compat.py was tested on {torch_compat.TESTED_TORCH}")


def test_recompile_limit_is_raised_never_lowered_and_bounds_recompiles():
    config = torch._dynamo.config
    assert isinstance(config.recompile_limit, int)
    old = config.recompile_limit
    try:
        for limit in (2, 16):
            config.recompile_limit = 2
            torch_compat.raise_recompile_limit(limit)
            torch._dynamo.reset()
            graphs = []

            def counting(gm, example_inputs):
                graphs.append(gm)  # noqa: B023 (compiled and called in this iteration); the backend is called once per compiled variant
                return gm.forward

            compiled = torch.compile(lambda x, k: x * k, backend=counting, dynamic=False)
            for k in range(4):  # each constant k is a new variant; past the limit they run eagerly
                assert torch.equal(compiled(torch.ones(2), k), torch.full((2,), float(k)))
            assert len(graphs) == min(limit, 4), (limit, len(graphs))
        torch_compat.raise_recompile_limit(4)
        assert config.recompile_limit == 16  # never lowered
    finally:
        config.recompile_limit = old
        torch._dynamo.reset()
