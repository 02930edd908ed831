"""Prefect flows: only wiring. ``pipeline`` runs every stage; one flow per stage reruns it alone."""
# Every `mlm` command and every Prefect flow imports this package first: registry addresses in
# tokenizer.from / pretrain.init_from (models:/NAME@ALIAS) resolve the same way in all of them (cheap: no
# MLflow import until an address is resolved).
from tasks.external import install as install_registry_resolver

install_registry_resolver()
