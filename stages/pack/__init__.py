"""The pack stage: padding-free execution of padded BERT-family sequence models.

:mod:`paretorch.stages.pack.stage` holds the record; :mod:`paretorch.stages.pack.packed` the packed module,
:mod:`paretorch.stages.pack.layout` the packing step (sequence starts on the host, the layout on
the device), :mod:`paretorch.stages.pack.deploy` the deployable callable (token id lists in, embeddings
out), :mod:`paretorch.stages.pack.attention` the variable-length attention kernels,
:mod:`paretorch.stages.pack.bert` what a packable model is and :mod:`paretorch.stages.pack.buckets` the
total-token buckets for static shapes.
"""
