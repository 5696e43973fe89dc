"""Reports: pandas frames from MLflow runs, plotly figures, coupling/stability analysis, HTML."""
