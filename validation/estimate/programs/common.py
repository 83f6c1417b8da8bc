"""Small models shared by the estimator's validation programs: plain PyTorch, built from sizes,
nothing downloaded."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, causal=True):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab=32000, dim=1024, layers=8, heads=16, checkpoint=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.checkpoint = checkpoint

    def forward(self, idx):
        x = self.emb(idx)
        for blk in self.blocks:
            if self.checkpoint and self.training:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return self.head(self.norm(x))


def train_steps(model, batch, seq, steps=3, vocab=32000, dtype=torch.bfloat16, lr=1e-4):
    opt = torch.optim.AdamW((p for p in model.parameters() if p.requires_grad), lr=lr)
    for _ in range(steps):
        idx = torch.randint(0, vocab, (batch, seq), device="cuda")
        with torch.autocast("cuda", dtype=dtype):
            logits = model(idx)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), idx.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return opt
