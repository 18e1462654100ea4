"""``iotwatch chaos``: the whole pipeline under load with every component killed on a seeded
schedule, then proofs from the data that nothing was lost and every promise held."""
