"""KV-cache inference: a bf16 GPT decodes 64 tokens for 8 prompts, the cache grown by cat."""
import torch
import torch.nn.functional as F
from common import GPT

torch.manual_seed(0)
model = GPT(dim=2048, layers=8, heads=16).to(torch.bfloat16).cuda().eval()


@torch.no_grad()
def decode(idx, new_tokens):
    caches = [None] * len(model.blocks)
    x_all = idx
    for step in range(new_tokens):
        x = model.emb(x_all if step == 0 else x_all[:, -1:])
        for i, blk in enumerate(model.blocks):
            b, t, d = x.shape
            q, k, v = blk.qkv(blk.norm1(x)).view(b, t, 3, blk.heads, d // blk.heads).unbind(2)
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))
            if caches[i] is not None:
                k = torch.cat([caches[i][0], k], dim=2)
                v = torch.cat([caches[i][1], v], dim=2)
            caches[i] = (k, v)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=step == 0)
            x = x + blk.proj(a.transpose(1, 2).reshape(b, t, d))
            x = x + blk.mlp(blk.norm2(x))
        logits = model.head(model.norm(x[:, -1]))
        x_all = torch.cat([x_all, logits.argmax(-1, keepdim=True)], dim=1)
    return x_all


decode(torch.randint(0, 32000, (8, 512), device="cuda"), 64)
