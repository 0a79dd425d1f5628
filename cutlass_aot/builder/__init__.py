"""The build side: manifest -> plan -> compile -> store. Imported by the CLI only."""
