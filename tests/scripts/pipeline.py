"""One training iteration of a pipeline stage, for the torchrun test jobs: rank r is stage r of a
chain, activations go forward and gradients back through ``p2p(send, tensor, peer)``."""
import torch


def iteration(stage, x, rank, world, p2p, after_forward=lambda: None):
    """Receives ``x`` from the stage before (except stage 0), runs ``stage``, then
    ``after_forward()``, sends on and runs backward with the gradient the next stage sends back."""
    if rank > 0:
        p2p(False, x, rank - 1)  # between zero_grad() and the forward: the step it begins
        x.requires_grad_()
    h = stage(x)
    after_forward()
    if rank < world - 1:
        p2p(True, h.detach(), rank + 1)
        grad = torch.empty_like(h)
        p2p(False, grad, rank + 1)
        h.backward(grad)
    else:
        h.sum().backward()
    if rank > 0:
        p2p(True, x.grad, rank - 1)
