"""The core: the rollout's row schema (``batch``), step grouping (``grouping``), credit
(``advantages``), the policy losses (``losses``) and the vocabularies a config chooses from
(``presets``). numpy and torch only: nothing here imports the config, the environments or the
training loop."""
