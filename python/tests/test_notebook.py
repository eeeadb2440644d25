"""A real notebook, run by nbclient in an ipykernel of this interpreter: a LocalCluster, a map
with its progress bar (shown by default in a notebook), a failed task whose remote traceback
shows in the cell's output, and the HTML views of the cluster, the client, a job and a future."""

import os
import re

import pytest

if os.environ.get("EMBER_FROM_WHEEL") == "1":
    import nbclient
    import nbformat
else:
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")

CELLS = [
    "import ember\n"
    "cluster = ember.LocalCluster(executors=1, cores=2)\n"
    "client = cluster.client()\n"
    "cluster",
    "client",
    "def square(x):\n"
    "    return x * x\n"
    "job = client.map(square, range(10))\n"
    "job.wait()\n"
    "print(job.results())\n"
    "job",
    "def fails(x):\n"
    "    raise ValueError(f'bad item {x}')\n"
    "client.submit(fails, 3).result(timeout=60)",
    "future = client.submit(square, 4)\n"
    "print(future.result(timeout=60))\n"
    "future",
    "cluster.close()\n"
    "print('running:', cluster.running)",
]


def outputs_of(cell, kind):
    return [output for output in cell.outputs if output.output_type == kind]


def text_of(cell, name):
    return "".join(o.text for o in outputs_of(cell, "stream") if o.name == name)


def html_of(cell):
    results = outputs_of(cell, "execute_result")
    assert results, cell
    assert "text/html" in results[0].data, results[0].data
    return results[0].data["text/html"]


def test_a_notebook_runs_a_local_cluster(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    notebook.cells[3].metadata["tags"] = ["raises-exception"]
    client = nbclient.NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    cluster, client_cell, mapped, failed, future, closed = notebook.cells

    assert "LocalCluster" in html_of(cluster) and "running" in html_of(cluster)
    assert "nats://127.0.0.1:" in html_of(client_cell)

    assert "[0, 1, 4, 9, 16, 25, 36, 49, 64, 81]" in text_of(mapped, "stdout")
    # The progress bar: a widget in Jupyter, text (here, with no widgets installed) otherwise.
    widgets = [o for o in outputs_of(mapped, "display_data")
               if "application/vnd.jupyter.widget-view+json" in o.data]
    bar = re.search(r"100%.* (\d+)/\1 ", text_of(mapped, "stderr"))
    assert widgets or bar, mapped.outputs
    assert "Warning" not in text_of(mapped, "stderr"), mapped.outputs
    assert "SUCCEEDED" in html_of(mapped)

    (error,) = outputs_of(failed, "error")
    assert error.ename == "ValueError" and error.evalue == "bad item 3"
    traceback = "\n".join(error.traceback)
    # The worker's traceback, down to the frame that raised, is in the cell's output.
    assert "RemoteTraceback" in traceback and ", in fails" in traceback, traceback

    assert "16" in text_of(future, "stdout")
    assert "finished" in html_of(future).lower()

    assert "running: False" in text_of(closed, "stdout")
