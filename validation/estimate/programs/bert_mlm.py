"""A Hugging Face BERT built from its config (no download), masked-LM training in fp32 with
TF32 matmuls and AdamW, 3 steps."""
import torch
from transformers import BertConfig, BertForMaskedLM

torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = True
config = BertConfig(hidden_size=768, num_hidden_layers=6, num_attention_heads=12, intermediate_size=3072)
model = BertForMaskedLM(config).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for _ in range(3):
    idx = torch.randint(0, config.vocab_size, (16, 512), device="cuda")
    labels = torch.full_like(idx, -100)
    labels[:, ::7] = idx[:, ::7]
    loss = model(input_ids=idx, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
