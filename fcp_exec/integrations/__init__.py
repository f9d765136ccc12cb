"""Integrations with the libraries trainers already use. Importing this package imports none of them:
``fcp_exec.integrations.hf`` (Hugging Face transformers) and ``hf_positions`` import transformers lazily;
``hf_trainer`` (``FCPTrainer``, a ``transformers.Trainer``) imports transformers and accelerate when imported."""
