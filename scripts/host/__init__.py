"""The serving box and the image: facts about the host, and the verbs that run there.

Verbs: doctor, serve, smoke, image, image_deps, gpu_tier (python -m scripts.host.<verb>; in the image through
docker/entrypoint: serve, doctor, smoke, test-gpu, test-serve (tests/gpu/serve)). Library: tools (tool outputs,
record/replay), nvml (live GPU facts), parsers (nvidia-smi -q -x and friends), topology (the one PCIe-only rule),
facts (what the doctor knows), checks (the doctor's registered checks), nccl (known-bad releases), nccl_transport
(NCCL's transport between the GPUs, from its INFO lines of a short all-reduce), pcie (the patched launcher asked
what it decides). Runs on the upstream image's python3: nothing here needs more than it ships.
"""
