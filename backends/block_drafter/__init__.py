"""SpecBlock's block drafter at the reference pair's scale: ``python -m backends.block_drafter``.

* ``model``: the network (K dependent slots, the layer-wise shift, the rank head) and its spec;
* ``train``: offline training on the pair's corpus (valid-prefix draft loss, rank loss) and
  the held-out acceptance by slot;
* ``drafter``: ``TorchBlockDrafter`` (a ``simlab.specblock.BlockDrafter`` over an ``HFPair``),
  save / load, the measured forward time;
* ``adapt``: the serving-time updates (skip, heads, full) with the KL anchor and snapshots;
* ``__main__``: the training tool.
"""
