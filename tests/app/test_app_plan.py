"""Issue 44, item 4 in the page: "which GPUs" (:mod:`app.planjob`, :mod:`app.tabs.plan`): the
clusters a comparison prices, its job in the search queue apart from the session's searches,
the worker's run (finished, and stopped with what it priced), and what the tab shows."""

from __future__ import annotations

import pytest

from app import planjob, sources, store, worker
from app import state as ST
from app.tabs import plan as PLAN
from engine.studies.plan import best_per_cluster, plan_points, plan_rows


@pytest.fixture()
def gpt2():
    return ST.new_state("gpt2", "dgx-h100:1", "data-parallel", batch=16)


def _queue(st: store.Store, state: dict, clusters: list[str], tokens: float = 1e10, prices=None) -> int:
    options = {"clusters": clusters, "tokens": tokens, "prices": prices or {}}
    return st.create_search(state["sid"], store.PLAN_JOB, "300s", 300.0, 0,
                            {**sources.refs(state), "options": options}, None)


class TestClusters:
    def test_types_times_sizes_with_a_note_for_a_size_a_type_does_not_come_in(self):
        out, notes = planjob.plan_clusters(["dgx-h100", "gb200-nvl72"], "64, 144")
        assert out == ["dgx-h100:8", "dgx-h100:18", "gb200-nvl72:2"]
        assert notes == ["gb200-nvl72 comes in nodes of 72 GPUs: not 64"]

    @pytest.mark.parametrize("types, gpus, what", [
        ([], "64", "pick at least one GPU type"),
        (["tpu-v5"], "64", "unknown GPU type 'tpu-v5'"),
        (["dgx-h100"], "", "give the GPU counts"),
        (["dgx-h100"], "64, x", "GPUs 'x': give whole numbers from 1 to 1,024"),
        (["dgx-h100"], "2048", "GPUs '2048'"),
        (["gb200-nvl72"], "64", "none of these GPU types comes in these sizes: gb200-nvl72 comes in nodes of 72"),
        (["dgx-h100", "dgx-h200", "dgx-b200"], "8 16 32", "9 clusters: the page compares at most 8"),
        ("dgx-h100", "64", "pick at least one GPU type"),  # (a crafted value: not a list)
    ])
    def test_what_cannot_be_priced_is_named(self, types, gpus, what):
        with pytest.raises(ValueError, match=None) as e:
            planjob.plan_clusters(types, gpus)
        assert str(e.value).startswith(what), str(e.value)

    def test_each_cluster_on_each_network_asked(self):
        """Issue 43: the co-design axis in the page: NICs, their rate, oversubscribed pods."""
        out, _ = planjob.plan_clusters(["dgx-h100"], "64", "nics=4,8 nic_gbps=400")
        assert out == ["dgx-h100:8+nics=4+nic_gbps=400", "dgx-h100:8+nics=8+nic_gbps=400"]
        assert planjob.plan_clusters(["dgx-h100"], "64", "  ")[0] == ["dgx-h100:8"]
        for text, what in (("nics=16", "at most one NIC per GPU"), ("wires=2", "network 'wires=2': write KEY=V1,V2"),
                           ("oversub=2", "cluster 'dgx-h100:8+oversub=2': oversub needs pod=GPUS"),
                           ("nics=0", "network: nics='0'"), ("nics=4" + " " * 300, "at most 300 characters"),
                           ("nics=1,2,3 nic_gbps=1,2,3", "9 clusters: the page compares at most 8"),
                           ("pod=12 oversub=2", "pods of 12 GPUs split a node")):
            with pytest.raises(ValueError) as e:
                planjob.plan_clusters(["dgx-h100"], "64", text)
            assert what in str(e.value), str(e.value)

    def test_prices(self):
        assert planjob.parse_price_text("dgx-h100=2.49, dgx-b200=4.9") == {"dgx-h100": 2.49, "dgx-b200": 4.9}
        assert planjob.parse_price_text("") == {}
        with pytest.raises(ValueError, match="price 'dgx-h100=abc': expected GPU_TYPE=PRICE"):
            planjob.parse_price_text("dgx-h100=abc")
        with pytest.raises(ValueError, match="price for 'h100': not a GPU type of the list"):
            planjob.parse_price_text("h100=2")


class TestEngine:
    def test_a_thinned_grid_keeps_a_micro_batch_per_shape_and_takes_clusters_in_turn(self):
        full = plan_points("gpt3-175b", ["dgx-h100:8", "dgx-b200:8"])
        thin = plan_points("gpt3-175b", ["dgx-h100:8", "dgx-b200:8"], thin=True)
        shape = lambda p: (p["cluster"], p["tp"], p["pp"], p["cp"], p.get("ep", 1), p.get("etp", 1))  # noqa: E731
        assert {shape(p) for p in thin} == {shape(p) for p in full}
        assert len(thin) < len(full) / 4
        assert [p["cluster"] for p in thin[:4]] == ["dgx-h100:8", "dgx-b200:8"] * 2

    def test_a_graph_prices_as_its_name_does(self):
        from engine.formats import resolve_model

        by_name = plan_rows("gpt2", ["dgx-h100:1"], batch=16, backend="serial")
        by_graph = plan_rows(resolve_model("gpt2", batch=16), ["dgx-h100:1"], backend="serial")
        assert by_name == by_graph and by_name
        with pytest.raises(ValueError, match="a batch is set on gpt2's graph itself"):
            plan_rows(resolve_model("gpt2", batch=16), ["dgx-h100:1"], batch=8, backend="serial")


class TestJob:
    def test_the_worker_prices_each_cluster_and_the_tab_shows_the_plans(self, gpt2, tmp_path):
        st = store.Store(tmp_path / "db.sqlite3")  # not the pool's: no worker claims this one
        job = _queue(st, gpt2, ["dgx-h100:1", "dgx-b200:1"], prices={"dgx-h100": 2.5})
        assert st.latest_search(gpt2["sid"]) is None  # a comparison is not the session's search
        row = st.claim_next(0)
        assert worker.run_search(st, row) == "finished", st.search(job)["error"]
        res = st.search(job)["result"]
        plans = res["plans"]
        assert [p["cluster"] for p in plans] == ["dgx-h100:1", "dgx-b200:1"]  # priced first, then by GPU-hours
        h100 = plans[0]
        assert h100["cost"] == pytest.approx(h100["gpu_hours"] * 2.5) and plans[1]["cost"] is None
        assert h100["days"] == pytest.approx(1e10 / (h100["tokens_per_s_per_gpu"] * 8) / 86400)
        # the same plans as soapbox plan's, on the thinned grid
        g = sources.graph_of(gpt2)
        cli = best_per_cluster(g, plan_rows(g, ["dgx-h100:1", "dgx-b200:1"], backend="serial"),
                               ["dgx-h100:1", "dgx-b200:1"], 1e10, {"dgx-h100": 2.5})
        assert [p["tokens_per_s_per_gpu"] for p in plans] == pytest.approx([p["tokens_per_s_per_gpu"] for p in cli])
        assert res["priced"] >= res["grid"] > 0
        assert st.progress_since(job, -1)[-1][1] == {"priced": res["priced"], "grid": res["grid"]}

    def test_a_stopped_comparison_keeps_what_it_priced(self, gpt2, tmp_path):
        st = store.Store(tmp_path / "db.sqlite3")
        job = _queue(st, gpt2, ["dgx-h100:1", "dgx-b200:1"])
        row = st.claim_next(0)
        st.request_stop(job)
        ticks = iter(float(i) for i in range(10 ** 6))  # a fake clock: 1 s a call, so it flushes at once
        assert worker.run_search(st, row, clock=lambda: next(ticks)) == "stopped"
        res = st.search(job)["result"]
        assert 0 < res["priced"] < res["grid"]
        assert {p["cluster"] for p in res["plans"]} == {"dgx-h100:1", "dgx-b200:1"}

    def test_a_model_without_tokens_fails_with_its_reason(self, tmp_path):
        alex = ST.new_state("alexnet", "dgx-h100:1")
        st = store.Store(tmp_path / "db.sqlite3")
        job = _queue(st, alex, ["dgx-h100:1"])
        assert worker.run_search(st, st.claim_next(0)) == "failed"
        assert st.search(job)["error"].startswith("alexnet is not a language model")


class TestTab:
    def test_start_refuses_what_it_cannot_price_and_names_it(self, gpt2):
        assert PLAN.plan_start(gpt2, ["dgx-h100"], "64", "lots", "") == (
            "Not started: 'lots': give a count like 1T, 300B or 2e12", True)
        alex = ST.new_state("alexnet", "dgx-h100:1")
        text, disabled = PLAN.plan_start(alex, ["dgx-h100"], "8", "1T", "")
        assert disabled and text.startswith("Not started: alexnet is not a language model")
        assert PLAN.plan_start({"sid": "x"}, ["dgx-h100"], "8", "1T", "")[1] is True  # a crafted state
        assert PLAN.model_line(gpt2).startswith("The page's model: gpt2, 16 sequences of 1,024 tokens")

    def test_the_table_names_a_cluster_where_nothing_fits(self):
        plans = [{"cluster": "dgx-h100:1", "gpus": 8, "days": None, "why": "no layout fits (12 tried; e.g. x)",
                  "feasible_layouts": 0, "layouts": 12}]
        table = PLAN.plan_table(plans)
        cells = [c.children for c in table.children[1].children[0].children]
        assert cells == ["dgx-h100:1", "8", "no layout fits (12 tried; e.g. x)", "0 / 12"]


class TestOpen:
    def test_a_rows_open_puts_the_page_on_its_cluster_under_its_layout(self, gpt2, tmp_path):
        from app import events as EV

        st = store.Store(tmp_path / "db.sqlite3")
        job = _queue(st, gpt2, ["dgx-h100:1", "dgx-b200:2"])
        assert worker.run_search(st, st.claim_next(0)) == "finished"
        view = {"result": st.search(job)["result"], "model": sources.refs(gpt2)["model"]}
        rows = PLAN.plan_rows_data(view)
        b200 = next(r for r in rows if r and r["cluster"] == "dgx-b200:2")
        new, msg = EV.on_event("plan-open", gpt2, plan=b200)
        assert msg.startswith("Opened the comparison's best layout on dgx-b200:2. Layout (megatron):"), msg
        assert new["cluster"]["name"] == "dgx-b200:2" and new["model"] == gpt2["model"]
        o = b200["options"]
        assert new["strategy"]["pipeline"]["stages"] == o["pp"]
        assert f"tp {o['tp']}" in msg and f"pp {o['pp']}" in msg
        # the page's simulation of it is the comparison's figure
        from app import simulation as SIM

        plan = next(p for p in view["result"]["plans"] if p["cluster"] == "dgx-b200:2")
        assert SIM.workspace(new).timeline.makespan_s == pytest.approx(plan["iteration_time_s"], rel=1e-6)

    def test_a_row_on_another_network_opens_on_that_network(self, gpt2, tmp_path):
        """A comparison on 1 NIC of 100 Gb/s a node: its row opens the page on that cluster,
        named with its network (the header's list then offers it), and the page's simulation
        is the comparison's figure."""
        from app import events as EV
        from app import simulation as SIM
        from app.layout import cluster_options

        name = "dgx-h100:2+nics=1+nic_gbps=100"
        st = store.Store(tmp_path / "db.sqlite3")
        job = _queue(st, gpt2, [name])
        assert worker.run_search(st, st.claim_next(0)) == "finished", st.search(job)["error"]
        view = {"result": st.search(job)["result"], "model": sources.refs(gpt2)["model"]}
        row = PLAN.plan_rows_data(view)[0]
        new, msg = EV.on_event("plan-open", gpt2, plan=row)
        assert msg.startswith(f"Opened the comparison's best layout on {name}."), msg
        assert new["cluster"]["name"] == name
        c = sources.cluster_of(new)
        assert c.name == name and {lk.bw_bytes_per_s for lk in c.links if lk.kind == "network"} == {100e9 / 8}
        plan = view["result"]["plans"][0]
        assert SIM.workspace(new).timeline.makespan_s == pytest.approx(plan["iteration_time_s"], rel=1e-6)
        assert cluster_options(name)[0] == {"label": f"{name} (another network)", "value": name}
        assert sources.family_sizes(name)[:2] == ["dgx-h100:1+nics=1+nic_gbps=100", "dgx-h100:2+nics=1+nic_gbps=100"]
        with pytest.raises(ValueError, match="more than the explorer simulates"):
            sources.preset_cluster("dgx-h100:1024+nics=1")

    def test_a_row_for_another_model_or_a_crafted_one_is_refused(self, gpt2):
        from app import events as EV

        row = {"cluster": "dgx-h100:1", "options": {"tp": 1, "pp": 1, "micro_batch": 1}, "model": {"name": "bert"}}
        same, msg = EV.on_event("plan-open", gpt2, plan=row)
        assert same is gpt2 and msg.startswith("That comparison priced another model")
        same, msg = EV.on_event("plan-open", gpt2, plan=dict(row, cluster="../../etc:1"))
        assert same is gpt2 and msg.startswith("Cannot open '../../etc:1'")
        assert EV.on_event("plan-open", gpt2, plan="x")[0] is gpt2


class TestNetworkField:
    """Issue 43: the header's network field puts the page's preset on another network."""

    def test_a_typed_network_changes_the_cluster_and_keeps_the_layout(self, gpt2):
        from app import events as EV
        from app.callbacks import network_text

        two = ST.new_state("gpt2", "dgx-h100:2", "megatron", batch=16)
        new, msg = EV.on_event("pick-network", two, network="  nic_gbps=100   nics=1 ")
        assert new["cluster"]["name"] == "dgx-h100:2+nics=1+nic_gbps=100", msg
        assert msg.startswith("Cluster: dgx-h100:2+nics=1+nic_gbps=100")
        assert network_text(new["cluster"]) == "nics=1 nic_gbps=100"
        assert {lk.bw_bytes_per_s for lk in sources.cluster_of(new).links if lk.kind == "network"} == {100e9 / 8}
        back, msg = EV.on_event("pick-network", new, network="")
        assert back["cluster"]["name"] == "dgx-h100:2" and network_text(back["cluster"]) == ""
        same, msg = EV.on_event("pick-network", new, network="nics=1 nic_gbps=100")
        assert same is new and msg == ""

    @pytest.mark.parametrize("text, why", [
        ("nics=16", "at most one NIC per GPU"), ("nics", "not KEY=VALUE"), ("wires=2", "not a network key"),
        ("oversub=2", "needs pod=GPUS"), ("nics=1e9", "whole number"), ("nics=4 nics=8", "given twice"),
    ])
    def test_a_network_the_nodes_cannot_have_is_refused_and_the_page_kept(self, gpt2, text, why):
        from app import events as EV

        same, msg = EV.on_event("pick-network", gpt2, network=text)
        assert same is gpt2 and msg.startswith("Network refused: ") and why in msg, msg
        assert EV.on_event("pick-network", gpt2, network=["x"])[0] is gpt2  # (a crafted value)
