{#- Fetch the page again every few seconds and swap in its `#status` part; on failure keep
    the last one, dimmed, with the reason. `data-refreshes` on `<html>` counts the swaps.
    Called with the interval in milliseconds. -#}
{% raw -%}
(function(every){
var root=document.documentElement,n=0;root.classList.add('js');
function note(t){var s=document.getElementById('stale');s.textContent=t;s.hidden=!t;}
function tick(){fetch(location.pathname+location.search,{cache:'no-store',
credentials:'same-origin',headers:{accept:'text/html'}})
.then(function(r){if(!r.ok){throw new Error('HTTP '+r.status);}return r.text();})
.then(function(t){var fresh=new DOMParser().parseFromString(t,'text/html')
.getElementById('status'),old=document.getElementById('status');
if(!fresh||!old){throw new Error('no status in the answer');}
old.replaceWith(fresh);n+=1;root.dataset.refreshes=String(n);note('');})
.catch(function(e){var old=document.getElementById('status');
if(old){old.classList.add('stale');}note('not refreshed: '+e.message);})
.then(function(){setTimeout(tick,every);});}
setTimeout(tick,every);})
{%- endraw %}
