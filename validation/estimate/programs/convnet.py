"""A vision model: a ResNet-style convnet with BatchNorm, channels-last, bf16 autocast, SGD."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


def block(cin, cout, stride):
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
    )


model = nn.Sequential(
    block(3, 64, 2), block(64, 128, 2), block(128, 256, 2), block(256, 512, 2),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000),
).cuda().to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for _ in range(3):
    x = torch.randn(64, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (64,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
