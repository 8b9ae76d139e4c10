"""The tree conv1d reference: a chain is nn.Conv1d over the history, every node sees its own path."""

import torch
import torch.nn.functional as F

from treewy.ops import naive_tree_conv1d, naive_tree_conv1d_commit
from treewy.testing import random_tree


def conv_over_sequence(seq: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Causal depthwise conv + SiLU over [B, L, C] with nn.functional.conv1d; last output per position."""
    C, W = weight.shape
    y = F.conv1d(seq.transpose(1, 2), weight[:, None, :], groups=C)  # valid conv: [B, C, L - W + 1]
    return F.silu(y.transpose(1, 2))


def test_every_node_convolves_its_own_path():
    gen = torch.Generator().manual_seed(0)
    B, C, W = 2, 6, 4
    for trial in range(10):
        tree = random_tree(int(torch.randint(1, 20, (1,), generator=gen)), gen)
        x = torch.randn(B, tree.num_nodes, C, dtype=torch.float64, generator=gen)
        weight = torch.randn(C, W, dtype=torch.float64, generator=gen)
        state = torch.randn(B, C, W - 1, dtype=torch.float64, generator=gen)
        y = naive_tree_conv1d(x, weight, state, tree)
        for t in range(tree.num_nodes):
            seq = torch.cat([state.transpose(1, 2), x[:, tree.path(t)]], 1)  # history then the path
            ref = conv_over_sequence(seq, weight)[:, -1]
            torch.testing.assert_close(y[:, t], ref, rtol=1e-12, atol=1e-12)
            new_state = naive_tree_conv1d_commit(x, state, tree, torch.full((B,), t))
            torch.testing.assert_close(new_state, seq[:, -(W - 1):].transpose(1, 2), rtol=0, atol=0)
