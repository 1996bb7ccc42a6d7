// When the tab closes (or reloads), tell the server it may drop this session's cached
// simulation at once instead of after its idle timeout. The session's state itself stays in
// the tab's sessionStorage (a reload finds it there).
window.addEventListener("pagehide", function () {
    try {
        var raw = window.sessionStorage.getItem("state");
        var sid = raw && JSON.parse(raw).sid;
        if (sid && navigator.sendBeacon) {
            navigator.sendBeacon(new URL("_soapbox/bye", document.baseURI).toString(), sid);
        }
    } catch (e) { /* nothing to tell */ }
});
