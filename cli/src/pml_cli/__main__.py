from pml_cli.main import app

app()
