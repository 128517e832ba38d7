// Run page actions beside Resume: Stop for a run whose studio job is running.
import { api, h, qs, toast } from "./util.js";

// Stop = SIGINT to the run's studio job, as Ctrl-C (the run checkpoints its last finished step).
// A run started on the command line has no job here: the button says where to stop it.
export function stopButton(runId) {
  const btn = h("button", { id: "stop-run", class: "danger", disabled: true }, "Stop");
  api(`/api/run/job?${qs({ run: runId })}`).then(({ job }) => {
    if (!job || job.state !== "running") {
      btn.title = "started outside the studio: stop it where it runs (Ctrl-C)";
      btn.dataset.state = "elsewhere";
      return;
    }
    btn.disabled = false;
    btn.dataset.job = job.id;
    btn.title = `stop job ${job.id} (SIGINT, as Ctrl-C: it checkpoints its last finished step; Resume goes on from there)`;
    btn.onclick = async () => {
      btn.disabled = true; btn.textContent = "stopping…";
      try {
        const r = await api("/api/job/stop", { id: job.id });
        toast(`job ${r.job.id}: ${r.job.state}`);
      } catch (e) {
        toast(e.message); btn.disabled = false; btn.textContent = "Stop";
      }
    };
  }).catch(e => { btn.title = e.message; });
  return btn;
}
