"""The presentation layer: Markdown and LaTeX tables (``render``), figures (``plots``) and the results site
(``report``). Imports the layers below; nothing imports it but the command line."""
