from django.contrib import admin
from django.urls import include, path
from shop.views import place

urlpatterns = [
    path("admin/", admin.site.urls),
    path("ops/echomq/", include("echomq.contrib.django.urls")),
    path("place/<str:item>/", place),
]
