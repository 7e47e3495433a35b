"""What the Streamlit pages show, computed without Streamlit: form mapping, tables, charts, exports."""
