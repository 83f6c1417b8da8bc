"""A data-dependent program: mixture-of-experts routing, each expert fed the tokens routed to it
(`nonzero`: how many depends on the values)."""
import torch
import torch.nn as nn

torch.manual_seed(0)
experts = nn.ModuleList(nn.Linear(1024, 1024) for _ in range(8)).cuda()
router = nn.Linear(1024, 8).cuda()
x = torch.randn(4096, 1024, device="cuda")
choice = router(x).argmax(-1)
out = torch.zeros_like(x)
for e, expert in enumerate(experts):
    rows = (choice == e).nonzero().squeeze(-1)
    out[rows] = expert(x[rows])
out.sum().backward()
