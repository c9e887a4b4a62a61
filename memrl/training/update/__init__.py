"""One rank's update: packing, logprobs, losses, LoRA, optimizer, Ulysses, prefix sharing, routing replay."""
