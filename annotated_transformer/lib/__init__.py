"""The library that runs the paper at scale, written by hand on top of the paper's modules, one concern a module.

Data: `downloads` (checksummed, resumable, mirrored), `datasets` (Multi30k, Tatoeba), `wmt14_files`. Text:
`tokenizers` (words, SentencePiece subwords), `vocab` (what a model's ids mean, stored with it). What to train:
`recipes`, `tasks`. What a run writes: `artifacts` (every file's kind and version), `files` (written whole),
`checkpoints`, `pretrained` (a model folder to share), `runs` (the run directory), `results`. Running:
`devices`, `processes` (`torchrun`), `progress`, `trainer`. Using a model: `translate`, `evaluate`, `viz`. The paper
at scale: `wmt`, `variations` (Table 3). Speed: `measure`, `bench`.
"""
