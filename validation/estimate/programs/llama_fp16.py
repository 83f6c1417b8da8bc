"""A Llama-style decoder (RMSNorm, rotary embeddings, SwiGLU, no biases) trained with fp16
autocast, a GradScaler, gradient clipping and SGD with momentum: 3 steps."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rotary(x, cos, sin):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        hidden = 8 * dim // 3
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, d // self.heads).transpose(1, 3).unbind(2)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab=32000, dim=1024, layers=6, heads=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        half = dim // heads // 2
        freqs = 1.0 / (10000 ** (torch.arange(half) / half))
        angles = torch.outer(torch.arange(2048), freqs)
        self.register_buffer("cos", angles.cos().repeat(1, 1), persistent=False)
        self.register_buffer("sin", angles.sin().repeat(1, 1), persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.emb(idx)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.head(self.norm(x))


torch.manual_seed(0)
model = Llama().cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
scaler = torch.amp.GradScaler("cuda")
for _ in range(3):
    idx = torch.randint(0, 32000, (4, 1024), device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), idx.view(-1))
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
