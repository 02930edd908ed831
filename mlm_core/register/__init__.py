"""The register stage (``stage``: the model card, the gates, the registry record) and what it is built from: the
promotion gates (``gates``) and the model card (``modelcard``)."""
