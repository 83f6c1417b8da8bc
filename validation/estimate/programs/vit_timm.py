"""A timm ViT-S/16 (no pretrained weights) trained with bf16 autocast and AdamW on 224x224
images: 3 steps."""
import timm
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=1000).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for _ in range(3):
    x = torch.randn(64, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
