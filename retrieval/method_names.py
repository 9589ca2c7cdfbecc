"""The names of the baselines and oracles (`retrieval.methods` dispatches them), importable without their code."""

BASELINES = ("random", "question-only", "lookup", "transition-table", "knn-future", "persistence", "zero-shot")
ORACLES = ("semantic-text", "paraphrase", "state-prototype", "independent-appearance")
#: The space kind each method needs ("any": semantic or visual).
NEEDS = {"random": "any", "question-only": "text", "lookup": "any", "transition-table": "any", "knn-future": "any",
         "persistence": "visual", "zero-shot": "visual", "semantic-text": "text", "paraphrase": "text",
         "state-prototype": "any", "independent-appearance": "any"}
